-- step_push.lua: a chain's jobs onto one of its steps' queues, in the lane of the request they serve
-- (worker/chain.py). The request was admitted once, as the chain's: its steps' jobs are not
-- admitted again. With no job waiting in any lane they go to the normal queue whatever their lane,
-- as push.lua does: that is the queue an idle worker blocks on.
--
-- KEYS[1]     the step version's high lane, funnel:queue-high:{<model>}:<version>
-- KEYS[2]     its normal lane, funnel:queue:{<model>}:<version>
-- KEYS[3]     its low lane, funnel:queue-low:{<model>}:<version>
-- ARGV[1]     the request's lane: 1 high, 2 normal, 3 low
-- ARGV[2..]   the jobs to LPUSH, wire bytes
-- Returns     the length of the queue they went to
local queue = KEYS[2]
if ARGV[1] ~= '2' and redis.call('LLEN', KEYS[1]) + redis.call('LLEN', KEYS[2]) + redis.call('LLEN', KEYS[3]) > 0 then
  queue = ARGV[1] == '1' and KEYS[1] or KEYS[3]
end
return redis.call('LPUSH', queue, unpack(ARGV, 2))
