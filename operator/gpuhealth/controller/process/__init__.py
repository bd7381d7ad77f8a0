"""The process around the rooms: Kopf's handlers and settings, the command line, the runtime that
builds the rooms and runs their workers and sweeper (the watches handing their events to intake's
feeders), leadership under Kopf peering, the watchdog and the heap profile."""
