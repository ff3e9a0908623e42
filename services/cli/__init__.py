"""taskline's command line: the one place that knows all three services and the client."""
