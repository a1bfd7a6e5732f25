"""Pictures of plans and runs: the plan picture (``hetrl show``), the Gantt chart of a trace
(``--gantt``), and the export of a plan to verl's trainer config (``hetrl export``)."""
