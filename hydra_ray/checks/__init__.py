"""What is checked before anything costs: the user's launcher settings, the
cluster config, and the resources each job asks Ray for."""
