-- push.lua: the web tier's push of one request's jobs onto a model's interactive queue, bounded
-- (web/pipeline.py). In one step, so concurrent requests cannot overfill the queue, and, with an
-- estimate, refused when the predicted answer is later than the request's budget
-- (web/queueing/shedding.py's Capacity.wait_s, the same formula).
--
-- KEYS[1]     the model's queue, funnel:queue:{<model>}
-- KEYS[2..]   the in-flight lists of the model's live workers, funnel:inflight:{<model>}:<worker>
--             (counted as jobs ahead, only with an estimate)
-- ARGV[1]     the queue's length limit (0: no limit)
-- ARGV[2]     1 to estimate the wait, else 0 (ARGV[3..9] are then unread)
-- ARGV[3]     the budget, seconds: the request's time left
-- ARGV[4]     the model's workers together, jobs per second (Capacity.rate)
-- ARGV[5]     a batch's seconds per item (Capacity.item_s)
-- ARGV[6]     a batch's fixed seconds (Capacity.batch_s)
-- ARGV[7]     the batch size
-- ARGV[8]     the safety factor times the calibration (answers later than predicted raise it)
-- ARGV[9]     seconds added to every prediction (OVERHEAD_S)
-- ARGV[10..]  the jobs to LPUSH, wire bytes
-- Returns     {1, the queue's new length, jobs ahead (-1: not estimated)} when pushed;
--             {0, the queue's length} when the queue is at its limit;
--             {-1, jobs ahead} when the predicted wait is past the budget.
local limit = tonumber(ARGV[1])
local queued = redis.call('LLEN', KEYS[1])
if limit > 0 and queued >= limit then return {0, queued} end
local ahead = -1
if ARGV[2] == '1' then
  ahead = queued
  for i = 2, #KEYS do ahead = ahead + redis.call('LLEN', KEYS[i]) end
  local rate, item_s, batch_s, size = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  local n = #ARGV - 9
  local k = math.min(size, ahead + n)
  local wait = math.max((ahead + n) / rate, item_s * k + batch_s) * tonumber(ARGV[8]) + tonumber(ARGV[9])
  if wait > tonumber(ARGV[3]) then return {-1, ahead} end
end
return {1, redis.call('LPUSH', KEYS[1], unpack(ARGV, 10)), ahead}
