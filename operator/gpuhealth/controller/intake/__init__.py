"""What the API server says, reduced to what gpuhealth reads: the list-then-watch reflector and its
instances (Nodes, reports, pods, Leases, ResourceSlices, Kueue objects), the slim shapes they keep,
and the per-node work queue. Imports only the controller's shared modules."""
