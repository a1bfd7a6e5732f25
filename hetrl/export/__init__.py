"""A plan as another system's configuration (``hetrl export``): verl's trainer overrides."""
