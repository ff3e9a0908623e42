"""Request and answer schemas of the API: strict body reading, list paging, the specs parsed from
request bodies, the JSON shapes answered (openapi.json documents them) and the error shape.

Pure parsing and shaping: nothing here reads PostgreSQL or Redis.
"""
