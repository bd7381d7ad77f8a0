"""`kubectl gpuhealth`: the on-call view of gpuhealth (fleet status, node detail, XID catalog, release, pause).

Layout, one concern per module:

* ``main``: the command line (argparse), dispatch and exit codes;
* ``client``: every Kubernetes API call the plugin makes;
* ``fleet``: pure summary of the fleet for ``status`` (rows, totals, GPU-hours and cost held out of service);
* ``nodeview``: pure model of one node for ``describe``;
* ``explain``: pure model of one XID catalog entry for ``explain``;
* ``changes``: pure planning of the writes ``release``, ``pause`` and ``resume`` make, and when they refuse;
* ``render``: pure text rendering (tables, describe, colours, ages).
"""
