"""Any .mar, as TorchServe's Python worker runs it, on Ray Serve, with TorchServe's inference API (docs/ray.md):
torchserve_api.py (the API's routes, key check and answers, pure), replica.py (one .mar in a replica), app.py (the
deployments and the ingress), driver.py (the Ray driver process) and engine.py (start, stop by pid)."""
