"""The parts of the Ray engine on a user's cluster (#67) that need no cluster and no root: the address, the token,
the refusals, the run folder's record, which applications `--stop` deletes, and the namespaces' commands of the
long tier's cluster (tests/system/test_ray_cluster.py runs them)."""

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from segserve.engines.engine_interface import open_engine
from segserve.engines.ray import cluster as clusters
from segserve.engines.ray.engine import RayServe
from segserve.errors import UsageError
from segserve.qa import ray_cluster
from segserve.qa.ray_cluster import Layout, Sent


@pytest.mark.parametrize("given", ["10.0.0.5:6379", "head.example:6380", "[fd00::5]:6379", " 127.0.0.1:1 "])
def test_a_gcs_address_is_taken(given):
    assert clusters.parse_address(given) == given.strip()


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ("ray://10.0.0.5:10001", "Ray Client's ray:// is not taken: give the GCS's HOST:PORT"),
        ("10.0.0.5", "not HOST:PORT"),
        ("10.0.0.5:0", "not HOST:PORT"),
        ("10.0.0.5:70000", "not HOST:PORT"),
        ("auto", "not HOST:PORT"),
    ],
)
def test_other_addresses_are_refused_with_what_to_give(given, said):
    with pytest.raises(UsageError, match=said.replace("(", r"\(").replace(")", r"\)")):
        clusters.parse_address(given)


def test_the_options_go_together_and_the_shared_folder_must_exist(tmp_path):
    assert clusters.from_options(None, None, False) is None  # a local Ray
    with pytest.raises(UsageError, match="--ray-address needs --ray-shared-dir DIR"):
        clusters.from_options("10.0.0.5:6379", None, False)
    with pytest.raises(UsageError, match="go with --ray-address"):
        clusters.from_options(None, str(tmp_path), False)
    with pytest.raises(UsageError, match="no such folder"):
        clusters.from_options("10.0.0.5:6379", str(tmp_path / "nope"), False)
    assert clusters.from_options("10.0.0.5:6379", str(tmp_path), True) == clusters.Cluster("10.0.0.5:6379", str(tmp_path), True)


def test_an_archive_outside_the_shared_folder_is_refused(tmp_path):
    cluster = clusters.Cluster("10.0.0.5:6379", str(tmp_path / "shared"))
    (tmp_path / "shared" / "store").mkdir(parents=True)
    assert clusters.outside_shared(cluster, [tmp_path / "shared" / "store", tmp_path / "shared" / "store" / "a.mar"]) is None
    said = clusters.outside_shared(cluster, [tmp_path / "shared" / "store", tmp_path / "shared" / ".." / "elsewhere"])
    assert said == f"{tmp_path / 'shared' / '..' / 'elsewhere'} is not under --ray-shared-dir {cluster.shared_dir}: " + (
        "the cluster's other nodes cannot read it (move it there)"
    )


def test_the_token_is_found_where_ray_looks_for_it(tmp_path):
    home = tmp_path / "home"
    assert clusters.token_environment({}, home) is None
    (home / ".ray").mkdir(parents=True)
    (home / ".ray" / "auth_token").write_text("abc\n")
    assert clusters.token_environment({}, home) == {"RAY_AUTH_TOKEN_PATH": str(home / ".ray" / "auth_token")}
    named = tmp_path / "token"
    named.write_text("def")
    assert clusters.token_environment({"RAY_AUTH_TOKEN_PATH": str(named)}, home) == {"RAY_AUTH_TOKEN_PATH": str(named)}
    both = {"RAY_AUTH_TOKEN": "xyz", "RAY_AUTH_TOKEN_PATH": str(named)}
    assert clusters.token_environment(both, home) == {"RAY_AUTH_TOKEN": "xyz"}  # Ray's order: the variable first
    with pytest.raises(UsageError, match=r"RAY_AUTH_TOKEN_PATH=.*missing: no token in that file"):
        clusters.token_environment({"RAY_AUTH_TOKEN_PATH": str(tmp_path / "missing")}, home)


def answers(without_token: str, with_token: str = "answered"):
    """A probe (cluster.auth_answer's signature) of a cluster that answers so, recording what it was sent."""
    asked = []

    def probe(address, settings):
        asked.append(settings)
        return without_token if settings["RAY_AUTH_MODE"] == "disabled" else with_token

    return probe, asked


def test_a_cluster_with_token_auth_off_is_refused_unless_the_user_says_so(tmp_path):
    probe, _ = answers("answered")
    with pytest.raises(UsageError, match=r"has token authentication off: .* or pass --ray-allow-no-auth to deploy anyway"):
        clusters.driver_environment(clusters.Cluster("h:6379", str(tmp_path)), {}, tmp_path, probe)
    allowed = clusters.Cluster("h:6379", str(tmp_path), allow_no_auth=True)
    assert clusters.driver_environment(allowed, {"RAY_AUTH_TOKEN": "t"}, tmp_path, probe) == {"RAY_AUTH_MODE": "disabled"}


def test_a_cluster_with_token_auth_gets_the_users_token_or_a_line_saying_where_to_put_it(tmp_path):
    cluster = clusters.Cluster("h:6379", str(tmp_path))
    probe, asked = answers("refused")
    assert clusters.driver_environment(cluster, {"RAY_AUTH_TOKEN": "t"}, tmp_path, probe) == {
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN": "t",
    }
    assert asked == [{"RAY_AUTH_MODE": "disabled"}, {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "t"}]
    with pytest.raises(UsageError, match=r"asks for a token: set RAY_AUTH_TOKEN, or RAY_AUTH_TOKEN_PATH"):
        clusters.driver_environment(cluster, {}, tmp_path, probe)
    wrong, _ = answers("refused", "refused")
    with pytest.raises(UsageError, match="refuses the token of RAY_AUTH_TOKEN: not this cluster's"):
        clusters.driver_environment(cluster, {"RAY_AUTH_TOKEN": "t"}, tmp_path, wrong)


def test_the_cluster_is_recorded_in_the_run_folder_for_the_other_commands(tmp_path):
    config = Path(__file__).parents[2] / "config.properties"
    given = clusters.Cluster("10.0.0.5:6379", str(tmp_path))
    started = open_engine("ray", tmp_path, tmp_path, config, ray_cluster=given)
    assert started.cluster == given and started.haproxy is False  # Serve's proxy on a cluster unless asked
    given.save(tmp_path)
    (tmp_path / "engine").write_text("ray\n")
    assert open_engine(None, tmp_path, tmp_path, config).cluster == given  # `scale`, `token`, `predict`, `serve --stop`
    assert open_engine("ray", tmp_path, tmp_path, config).cluster is None  # `serve --engine ray` without --ray-address: local
    with pytest.raises(UsageError, match="--ray-address deploys the Ray engine onto a running Ray cluster: add --engine ray"):
        open_engine("torchserve", tmp_path, tmp_path, config, ray_cluster=given)
    (tmp_path / "ray_cluster.json").write_text("{")
    with pytest.raises(Exception, match="ray_cluster.json: unreadable"):
        clusters.recorded(tmp_path)


def test_serve_refuses_the_cluster_options_without_the_ray_engine_and_without_a_shared_folder(tmp_path):
    from segserve.cli import cmd_serve

    base = {"stop": False, "ray_proxy": None, "run_dir": str(tmp_path), "ray_shared_dir": None, "ray_allow_no_auth": False}
    with pytest.raises(UsageError, match="--ray-address needs --ray-shared-dir"):
        cmd_serve.run(SimpleNamespace(engine="ray", ray_address="10.0.0.5:6379", **base))
    with pytest.raises(UsageError, match="add --engine ray"):
        config = str(Path(__file__).parents[2] / "config.properties")
        cmd_serve.run(
            SimpleNamespace(
                engine=None,
                ray_address="10.0.0.5:6379",
                **base | {"ray_shared_dir": str(tmp_path), "config": config, "model_store": str(tmp_path)},
            )
        )


def test_start_refuses_haproxy_and_a_model_store_outside_the_shared_folder_before_anything_runs(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    cluster = clusters.Cluster("10.0.0.5:6379", str(shared))
    with pytest.raises(UsageError, match="HAProxy mode is set by each node's environment"):
        RayServe(tmp_path / "run", model_store=shared, cluster=cluster, haproxy=True).start()
    with pytest.raises(UsageError, match=r"store is not under --ray-shared-dir"):
        RayServe(tmp_path / "run", model_store=tmp_path / "store", cluster=cluster).start()
    assert not (tmp_path / "run" / "ray_driver.pid").exists()  # no driver was started


def test_stop_deletes_the_ingress_first_then_every_models_application_and_nothing_else():
    from segserve.engines.ray.driver import ours

    assert ours(["model:b", "someone_else", "torchserve", "model:a", "models"]) == ["torchserve", "model:a", "model:b"]


def test_the_namespaces_are_made_joined_by_a_bridge_and_removed():
    layout = Layout("42", workers=2)
    assert layout.nodes == ["head", "w1", "w2"] and layout.gcs_address == "10.233.67.2:6379"
    made = [" ".join(c) for c in ray_cluster.network_commands(layout)]
    assert made[:3] == ["ip link add srb42 type bridge", "ip addr add 10.233.67.1/24 dev srb42", "ip link set srb42 up"]
    assert "ip link set sr422o master srb42" in made and "ip netns exec segray-42-w2 ip addr add 10.233.67.4/24 dev sr422i" in made
    assert sum(c.startswith("ip netns add ") for c in made) == 3
    removed = [" ".join(c) for c in ray_cluster.teardown_commands(layout)]
    assert removed == ["ip netns del segray-42-head", "ip netns del segray-42-w1", "ip netns del segray-42-w2", "ip link del srb42"]
    with pytest.raises(UsageError, match="longer than 15 characters"):
        Layout("123456789012")


def test_each_node_starts_in_its_namespace_with_its_own_temp_folder_and_token_auth(tmp_path):
    layout = Layout("7")
    head = ray_cluster.node_command(layout, "head", tmp_path / "head", ray="ray")
    assert head[:6] == ["ip", "netns", "exec", "segray-7-head", "ray", "start"] and "--block" in head
    assert head[head.index("--temp-dir") + 1] == str(tmp_path / "head") and head[head.index("--node-ip-address") + 1] == "10.233.67.2"
    assert "--head" in head and head[head.index("--port") + 1] == "6379"
    worker = ray_cluster.node_command(layout, "w1", tmp_path / "w1", ray="ray")
    assert worker[worker.index("--address") + 1] == "10.233.67.2:6379" and "--head" not in worker
    given = {
        "RAY_AUTH_TOKEN": "x",
        "RAY_SERVE_ENABLE_HA_PROXY": "1",
        "RAY_ADDRESS": "a",
        "RAY_health_check_timeout_ms": "1",
        "PATH": "/bin",
    }
    env = ray_cluster.node_environment(given, tmp_path / "t")
    assert env == {
        "PATH": "/bin",
        "RAY_AUTH_MODE": "token",
        "RAY_AUTH_TOKEN_PATH": str(tmp_path / "t"),
        "RAY_USAGE_STATS_ENABLED": "0",
        # a lost node found dead in about 5 s, not 15 (the recovery goal's margin): set, whatever the caller's were
        "RAY_health_check_period_ms": "1000",
        "RAY_health_check_failure_threshold": "5",
    }
    assert ray_cluster.subnet_in_use("10.233.67", "5: srb1    inet 10.233.67.1/24 scope global srb1")
    assert not ray_cluster.subnet_in_use("10.233.67", "2: eth0    inet 10.233.6.1/24 scope global eth0")


def test_the_load_outcome_counts_answers_failures_and_requests_past_the_clients_timeout():
    sent = [Sent(0, 0.1, 200)] * 18 + [Sent(1, 1.2, 500), Sent(2, 32, 0, "timeout")]
    seen = ray_cluster.outcome(sent, timeout_s=30)
    assert {k: seen[k] for k in ("sent", "answered", "ok_2xx", "failed", "unanswered")} == {
        "sent": 20,
        "answered": 19,
        "ok_2xx": 18,
        "failed": 2,
        "unanswered": 1,
    }
    assert seen["ok_share"] == 0.9 and seen["errors"] == ["500", "timeout"] and json.dumps(seen)
