"""Workflow handler of seg_fanout.war: where function nodes of the DAG would live.

torch-workflow-archiver requires this file; like seg_jpeg, seg_fanout has model nodes only
(a function node runs in the frontend's single workflow worker, without batching).
"""
