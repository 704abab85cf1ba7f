"""The driver that runs a sweep on a cluster's head, and the protocol it shares
with the launching machine."""
