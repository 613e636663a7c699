-- load_claim.lua: a worker with several models claims the loading of one of them (worker/residency.py),
-- so that two workers do not both load a model for the same work; the claim lapses with its TTL if
-- its holder dies mid-load, and is kept a while after the load, until the registry shows it resident.
--
-- KEYS[1]  the model version's claim, funnel:loading:{<model>}:<version>
-- ARGV[1]  the claiming worker's id
-- ARGV[2]  the claim's TTL (ms) from now: set when free or already this worker's, else left alone
-- Returns  1 if the claim is this worker's now, else 0 (another worker holds it)
local holder = redis.call('GET', KEYS[1])
if holder and holder ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', tonumber(ARGV[2]))
return 1
