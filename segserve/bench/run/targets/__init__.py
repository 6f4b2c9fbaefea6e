"""How a point of each kind of target is put in place (#50): one module per kind, behind Kind (kind.py).

torchserve_targets.py  the catalog's targets and a user's .mar/.war, on a TorchServe of the bench's own
command_targets.py     a command target: a peer server's command, started for its points
http_targets.py        an http target: an endpoint segserve did not deploy, only checked and measured
best.py                what each kind writes to best/ for its best point (files, register.sh, manifests)

bench/run/deploy.py's Deployment asks each kind whether it owns a point's target, stops the others' servers (two
servers would share the machine) and has that kind deploy the point.
"""
