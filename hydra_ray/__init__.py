"""The implementation of the hydra-ray-launcher distribution; Hydra sees only its
face, `hydra_plugins.hydra_ray_launcher`. By layer, each importing only those
before it:

- `core`: the sweep's data types, records and errors (no Ray);
- `checks`: the user's settings and each job's resources, checked before
  anything costs; `infra`: connecting to Ray, a cluster's life, moving files;
- `engine`: the jobs as Ray tasks, what runs in a worker, the gather, the report;
- `driver`: the protocol with, and the driver on, a cluster's head;
- `launch`: the launch skeleton, the sweep's book, and one module per way of
  reaching Ray (`local`, `cluster`, `jobs_api`).
"""

# The Hydra face: the package Hydra's plugin scan finds, which ships with this one.
FACE = "hydra_plugins.hydra_ray_launcher"
