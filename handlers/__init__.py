"""TorchServe handlers of segserve.

Everything in this package runs inside a TorchServe worker. It is copied
whole into every .mar so that the archives run on stock TorchServe with
only torch and torchvision installed: import nothing from `segserve` here.

The package itself imports nothing: `segserve` reads the catalog's DAGs (handlers.dag) without torch.
A module that imports torchvision imports handlers.light_torchvision first.
"""
