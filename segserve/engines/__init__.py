"""The engines that serve archives. TorchServe's is segserve/serving/ (today's default); Ray Serve's is ray/. What
both run of TorchServe's frontend-to-worker protocol around a handler is written once, in worker_protocol.py."""
