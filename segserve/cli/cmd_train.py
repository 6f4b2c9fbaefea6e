"""`segserve train`: the network trained on synthetic data."""

from pathlib import Path


def add_parser(sub, common) -> None:
    p = sub.add_parser("train", help="train the model on synthetic data")
    p.add_argument("--weights", default="weights/seg.pt", help="where the trained state_dict goes (and a report beside it, .json)")
    p.add_argument(
        "--backbone", default="mobilenet_v3_small", choices=["mobilenet_v3_small", "mobilenet_v3_large"], help="torchvision backbone"
    )
    p.add_argument("--steps", type=int, default=700, help="training steps (deterministic: fixed seeds, 2 threads)")
    p.set_defaults(run=run)


def run(args) -> int:
    from segserve.model.train import TrainSettings, train

    train(Path(args.weights), TrainSettings(backbone=args.backbone, steps=args.steps))
    return 0
