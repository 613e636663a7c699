-- recovery_claim.lua: claim a dead worker's in-flight jobs, once (worker/recovery.py): move them
-- to its recovering list, unless the worker is alive or another peer holds the claim.
--
-- KEYS[1]  the dead worker's heartbeat hash, funnel:worker:{<model>}:<worker>
-- KEYS[2]  its in-flight list, funnel:inflight:{<model>}:<worker>
-- KEYS[3]  its recovering list, funnel:recovering:{<model>}:<worker>
-- KEYS[4]  the claim's lock, funnel:recovering:{<model>}:<worker>:lock
-- ARGV[1]  the claimer's id (the lock's value)
-- ARGV[2]  the lock's lifetime, ms: a claimer that dies mid-recovery releases it after this
-- Returns  1 when claimed (the jobs are on the recovering list, in order); 0 when the worker is
--          alive or another peer holds the claim.
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
if not redis.call('SET', KEYS[4], ARGV[1], 'NX', 'PX', ARGV[2]) then return 0 end
local job = redis.call('RPOPLPUSH', KEYS[2], KEYS[3])
while job do job = redis.call('RPOPLPUSH', KEYS[2], KEYS[3]) end
return 1
