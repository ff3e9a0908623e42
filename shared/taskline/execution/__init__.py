"""Running claimed jobs: attempts, their leases and fence, the handler call and the recording of
outcomes. The worker's loop and `taskline.testing.drain` both run jobs through this package, so
there is one implementation of the attempt's state machine."""
