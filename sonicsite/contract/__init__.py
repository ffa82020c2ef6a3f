"""What the parts of the site say to each other, each defined once (wire.py): the headers
that route and answer requests, the server and admission records, `/v1/site`'s shape, and
the local site's state file. Standard library only, so that every room may import it.
Beside it: `options.py` (command-line option types) and `provenance.py` (a result's `meta`)."""
