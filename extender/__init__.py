"""Extender: the kube-scheduler extender service (filter and prioritize by predicted power)."""
