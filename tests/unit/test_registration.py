"""TorchServe's registration parameters, spelt once (segserve/archives/registration.py, #50)."""

from segserve.archives import registration
from segserve.archives.registration import REGISTRATIONS
from segserve.bench.suite.params import PARAMS


def test_every_registration_value_of_the_suite_is_spelt_in_the_table_and_nothing_else():
    registered = {name for name, param in PARAMS.items() if param.registration}
    assert registered == set(REGISTRATIONS) == {"batch_size", "max_batch_delay_ms", "response_timeout", "retry_attempts"}
    for name in registered:
        assert PARAMS[name].registration is REGISTRATIONS[name] and PARAMS[name].level == "archive"


def test_each_place_gets_its_own_spelling_and_unit():
    values = {"batch_size": 8, "max_batch_delay_ms": 5, "response_timeout": 30}
    assert registration.query(values) == "&batch_size=8&max_batch_delay=5&response_timeout=30"
    assert registration.query({"batch_size": None}) == ""  # unset: the archive's own
    assert registration.workflow_entry(values, 2) == {
        "batch-size": 8,
        "max-batch-delay": 5,
        "timeout-ms": 30000,
        "min-workers": 2,
        "max-workers": 2,
    }
    assert registration.model_config_entry(values, 1) == {
        "minWorkers": 1,
        "maxWorkers": 1,
        "batchSize": 8,
        "maxBatchDelay": 5,
        "responseTimeout": 30,
    }
    assert registration.scale_query(3) == "min_worker=3&max_worker=3&synchronous=true"
    # retries are a workflow spec's alone: no query key, no model config key (TorchServe has none)
    assert registration.query({"retry_attempts": 1}) == "" and registration.model_config_entry({"retry_attempts": 1}) == {}
    assert registration.workflow_entry({"retry_attempts": 0}) == {"retry-attempts": 0}


def test_a_workflow_entry_reads_back_as_the_values_it_was_written_from():
    values = {"batch_size": 4, "max_batch_delay_ms": 50, "response_timeout": 7, "retry_attempts": 1}
    entry = registration.workflow_entry(values, 3)
    assert registration.from_workflow(entry) == values
    assert set(entry) <= set(registration.WORKFLOW_MODEL_KEYS)  # a spec's keys that are not nodes


def test_a_dag_wide_timeout_and_retries_go_to_the_top_level_first_where_a_spec_lacks_them_in_place_where_it_has_them():
    # the only values a function node takes (WorkFlow.java, archives/war.py): derived from the reader's defaults
    assert registration.WORKFLOW_LEVEL_KEYS == ("retry-attempts", "timeout-ms")
    top = registration.workflow_top({"response_timeout": 5, "retry_attempts": 1, "batch_size": 4, "pre_response_timeout": 9})
    assert top == {"timeout-ms": 5000, "retry-attempts": 1}  # batching and a node's own value stay per node
    models = {"batch-size": 1, "pre": {"url": "pre.mar"}, "timeout-ms": 300000}
    written = registration.write_models(models, {**top, "pre": {"timeout-ms": 5000}})
    assert list(written) == ["retry-attempts", "batch-size", "pre", "timeout-ms"]
    assert written == {"retry-attempts": 1, "batch-size": 1, "pre": {"url": "pre.mar", "timeout-ms": 5000}, "timeout-ms": 5000}
    assert models == {"batch-size": 1, "pre": {"url": "pre.mar"}, "timeout-ms": 300000}  # a new mapping: the spec read is kept
