"""`segserve bench`: grid-search serving parameters on a live TorchServe and name the best point."""
