"""The launch skeleton every launcher goes through, the sweep's book and session,
the dry run, and one module per way of reaching Ray: `local` (a local Ray, an
existing cluster, Ray Client), `cluster` (Ray's cluster launcher), `jobs_api`
(a cluster's dashboard)."""
