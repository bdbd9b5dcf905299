"""ComputeDomains: multi-node NVLink memory sharing through IMEX daemons and channels.

A user creates one ComputeDomain and points a job's pods at the ResourceClaimTemplate it
names. The controller (:mod:`.controller`, a leader-elected Deployment) turns each domain into
that template, one IMEX daemon per participating node and the domain's status; the node agent
publishes the IMEX channel and daemon devices and prepares their claims. The API objects are
read and written through :mod:`.api`; every decision the controller takes is made by the pure
planner in :mod:`.planner`.
"""
