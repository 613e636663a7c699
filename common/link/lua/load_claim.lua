-- load_claim.lua: a worker with several models claims the loading of one of them (worker/residency.py),
-- so that two workers do not both load a model for the same work; the claim lapses with its TTL if
-- its holder dies mid-load, and is kept a while after the load, until the registry shows it resident.
--
-- KEYS[1]  the model version's claim, funnel:loading:{<model>}:<version>
-- ARGV[1]  the claiming worker's id
-- ARGV[2]  the claim's TTL (ms) from now: set when free or already this worker's, else left alone;
--          0: released (deleted) if this worker's (a load given up on at its timeout)
-- Returns  1 if the claim is (or was, released) this worker's, else 0 (another worker holds it)
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
local ttl = tonumber(ARGV[2])
if ttl == 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ttl)
end
return 1
