"""The docs cannot drift (#18): generated pages match the code, every suite names its JSON Schema and an editor's
validator flags a typo with it, and every documented command is run here or by a named test."""

from segserve.docs import doccheck


def test_every_documented_command_is_run_or_named_with_its_test(trained_weights):
    assert doccheck.check(log=print) == []
