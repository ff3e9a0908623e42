"""The API's HTTP server: the gunicorn worker and its settings, request framing, connection
balancing, browser guards, authentication, `wait_s` parking and the /metrics exposition.

Nothing here knows a route or a use case; the routes (taskline_producer.routes) use `auth`,
`waiting` and `encoder` from here.
"""
