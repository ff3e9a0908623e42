"""The API's routes: one Flask blueprint per resource. A route parses its request
(taskline_producer.schemas), calls a use case (taskline_producer.operations) and shapes the
answer; it never imports the store or the dispatcher (an import-linter contract).
"""
