"""`triarch verify`: a live cluster against the plan, layer by layer.

Where: every GPU node of a pool carries the planned labels and taint and advertises the planned nvidia.com/gpu, and
the driver GPU feature discovery reports satisfies the driver/CUDA matrix for every image placed there; the device
plugin, the DCGM exporter and Karpenter are ready. How: the KubeRay operator is ready and every Ray Serve application
is RUNNING. When: every vLLM server answers /health, lists its model on /v1/models and exports the metrics the
alerts read. The checks are pure functions of what `kubectl get -o json` and the servers return, one module per
layer (where, how, when; base holds the finding and the report); `cluster.Cluster` fetches that through testinfra's
local host (kubectl and a port-forward per server), and `run.verify` runs every check in order.
"""
