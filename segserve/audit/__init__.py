"""`segserve audit`: a user's own TorchServe checked against the security rules (issue #58, docs/security.md):
the config file read as Java and TorchServe read it (`java_properties.py`, `config_file.py`), the rules as one table
(`security_rules.py`), and what a running server says (`live.py`)."""
