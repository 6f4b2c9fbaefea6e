"""Workflow handler of seg_jpeg.war: where function nodes of the DAG would live.

torch-workflow-archiver requires this file. seg_jpeg has no function nodes on
purpose: TorchServe runs a function node in the frontend's single workflow
worker with no batching, so every step is a model node with its own workers.
"""
