"""The node power controller: consolidate, power off what is empty, wake it when pods need it.

`policy` is the decision as a pure function (shared with the energy simulation); the rest of
the package (coming) maps Kubernetes objects in and out, acts through power drivers
(Redfish, IPMI, dry-run), and runs leader-elected as `python -m controllers.node_power`.
"""
