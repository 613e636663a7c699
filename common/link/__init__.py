"""Funnel's link to Redis: connecting by URL, a Sentinel or a Cluster (connection), a thread's own
connection for its round trips (line), and the Lua scripts (lua/) with their loader (lua_scripts)."""
