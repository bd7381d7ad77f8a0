"""What the API server says, reduced to what gpuhealth reads, and put where the rooms read it: the
list-then-watch reflector and its instances (Nodes, reports, pods, Leases, ResourceSlices, Kueue
objects), the feeders that put each event into the store (``state``) and queue the nodes it may
affect, and the per-node work queue. Imports ``state`` and the controller's shared modules."""
