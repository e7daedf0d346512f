"""Observation: the metrics log, Prometheus, network health, status views, report and dashboard. Metric names are the leaf swarm_node/metric_names.py."""
