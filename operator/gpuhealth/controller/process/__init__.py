"""The process around the rooms: Kopf's handlers and settings, the command line, the runtime that
builds the rooms and runs their workers and sweeper, leadership under Kopf peering, the feeders that
route watch events into the state and the queue, the watchdog and the heap profile."""
