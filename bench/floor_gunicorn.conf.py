"""gunicorn hooks of the HTTP floor (bench/floor_app.py): the API's least-connections accepting.

The worker class, threads and keep-alive come from the API's gunicorn.conf.py on the command
line (bench/stack.py); these hooks give its worker class the shared table it balances by, so
the floor places connections as the API does.
"""

from taskline_producer.http.balancer import assign_slot, free_slot, share_table

on_starting = share_table
pre_fork = assign_slot
child_exit = free_slot
