"""Job streams: waves of worker jobs sent through the site with the sonicsite client, as
CRAB runs them on the grid (`sonicsite submit`), and their report."""
