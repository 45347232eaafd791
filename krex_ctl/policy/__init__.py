"""krex's decisions, with no I/O: the region lifecycle as a state machine (regions), which requests may start
(scheduler), whose processes are a region's siblings (jobs), who is frozen by whom (freezes), and the lifecycle
barrier (lifecycle). Events come in with the time they happened; effects go out for the server to carry out
(it alone sends, signals and touches processes). Unit tests drive these modules directly."""
