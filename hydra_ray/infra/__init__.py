"""What the launch paths stand on outside Ray's tasks: checking and connecting to
a Ray cluster, a cluster's life under Ray's cluster launcher, rsync and storage
transfers, local scratch dirs, stray processes."""
