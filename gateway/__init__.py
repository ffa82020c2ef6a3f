"""sonicsite.gateway: the site's HTTP front door (KServe v2 REST, /v1/site, status page)."""
