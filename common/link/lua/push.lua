-- push.lua: the web tier's push of one request's jobs onto a model version's queue in its priority
-- lane, bounded (web/pipeline.py). In one step, so concurrent requests cannot overfill the queue,
-- and, with an estimate, refused when the predicted answer is later than the request's budget
-- (web/queueing/shedding.py's Capacity.wait_s, the same formula). With the caller's API key
-- limited (web/queueing/limits.py), its rate (a token bucket) and its requests under way (a set
-- of request tokens, each scored by its deadline) are checked first, and charged only when the
-- jobs are pushed. The jobs ahead of a request are those of its lane and the lanes above it
-- (common/contracts/priority.py): the queue's limit and the predicted wait turn a low request away first.
-- With no job waiting in any lane, the jobs go to the normal queue whatever their lane: they are
-- at the front of the line anyway, and that is the queue an idle worker blocks on.
-- The limit and the wait count items: a job holds a request's items (common/contracts/wire.py), and the jobs
-- ahead count as many items each as the web's estimate of a job's items (ARGV[19]), since a list's
-- length is all Redis knows of them without reading every message.
--
-- KEYS[1]     the version's high lane, funnel:queue-high:{<model>}:<version>
-- KEYS[2]     its normal lane, funnel:queue:{<model>}:<version>
-- KEYS[3]     its low lane, funnel:queue-low:{<model>}:<version>
-- KEYS[4]     the caller's token bucket on this model, funnel:limit:{<model>}:<owner> (a hash:
--             tokens, ms), read only when ARGV[10] is 1
-- KEYS[5]     the caller's requests under way on this model, funnel:running:{<model>}:<owner>,
--             read only when ARGV[10] is 1
-- KEYS[6..]   the in-flight lists of the model's live workers, funnel:inflight:{<model>}:<worker>
--             (counted as jobs ahead, only with an estimate)
-- ARGV[1]     the queue's limit, items (0: no limit)
-- ARGV[2]     1 to estimate the wait, else 0 (ARGV[3..9] are then unread)
-- ARGV[3]     the budget, seconds: the request's time left
-- ARGV[4]     the model's workers together, jobs per second (Capacity.rate)
-- ARGV[5]     a batch's seconds per item (Capacity.item_s)
-- ARGV[6]     a batch's fixed seconds (Capacity.batch_s)
-- ARGV[7]     the batch size
-- ARGV[8]     the safety factor times the calibration (answers later than predicted raise it)
-- ARGV[9]     seconds added to every prediction (OVERHEAD_S)
-- ARGV[10]    1 when the caller's key is limited, else 0 (ARGV[11..16] are then unread)
-- ARGV[11]    the key's rate, requests per second (0: no rate limit)
-- ARGV[12]    the key's burst, requests
-- ARGV[13]    the key's requests under way at most (0: no cap)
-- ARGV[14]    now, epoch ms
-- ARGV[15]    this request's token (its first job's id)
-- ARGV[16]    this request's deadline, epoch ms
-- ARGV[17]    the request's lane: 1 high, 2 normal, 3 low (its queue is KEYS[ARGV[17]])
-- ARGV[18]    the request's items
-- ARGV[19]    the items of a job queued or in flight, on average (the web's estimate)
-- ARGV[20..]  the jobs to LPUSH, wire bytes
-- Returns     {1, the new length of the queue it went to, items ahead (-1: not estimated)} when pushed;
--             {0, items queued in its lane and above} when they are at the queue's limit;
--             {-1, items ahead} when the predicted wait is past the budget;
--             {-2, ms until the key has a token} past the key's rate;
--             {-3, ms until its earliest request under way is past its deadline} at the key's cap.
local FIRST_JOB = 20
local lane = tonumber(ARGV[17])
local n, per_job = tonumber(ARGV[18]), tonumber(ARGV[19])
local limited = ARGV[10] == '1'
local tokens, now
if limited then
  local rate, burst, cap = tonumber(ARGV[11]), tonumber(ARGV[12]), tonumber(ARGV[13])
  now = tonumber(ARGV[14])
  if rate > 0 then
    local bucket = redis.call('HMGET', KEYS[4], 'tokens', 'ms')
    tokens = math.min(burst, (tonumber(bucket[1]) or burst) + math.max(0, now - (tonumber(bucket[2]) or now)) * rate / 1000)
    if tokens < 1 then return {-2, math.ceil((1 - tokens) * 1000 / rate)} end
  end
  if cap > 0 then
    redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)  -- requests past their deadline: over
    if redis.call('ZCARD', KEYS[5]) >= cap then
      local earliest = redis.call('ZRANGE', KEYS[5], 0, 0, 'WITHSCORES')
      return {-3, math.max(1, tonumber(earliest[2]) - now)}
    end
  end
end
local limit = tonumber(ARGV[1])
local waiting, queued = 0, 0  -- jobs in every lane; in the request's lane and those above it
for i = 1, 3 do
  local length = redis.call('LLEN', KEYS[i])
  waiting = waiting + length
  if i <= lane then queued = queued + length end
end
queued = math.ceil(queued * per_job)  -- items, estimated
if limit > 0 and queued >= limit then return {0, queued} end
local ahead = -1
if ARGV[2] == '1' then
  local held = 0
  for i = 6, #KEYS do held = held + redis.call('LLEN', KEYS[i]) end
  ahead = queued + math.ceil(held * per_job)
  local rate, item_s, batch_s, size = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  local k = math.min(size, ahead + n)
  local wait = math.max((ahead + n) / rate, item_s * k + batch_s) * tonumber(ARGV[8]) + tonumber(ARGV[9])
  if wait > tonumber(ARGV[3]) then return {-1, ahead} end
end
if limited then
  local deadline = tonumber(ARGV[16])
  if tokens then
    redis.call('HSET', KEYS[4], 'tokens', tokens - 1, 'ms', now)
    redis.call('PEXPIRE', KEYS[4], math.ceil(tonumber(ARGV[12]) * 1000 / tonumber(ARGV[11])) + 1000)  -- full again by then
  end
  if tonumber(ARGV[13]) > 0 then
    redis.call('ZADD', KEYS[5], deadline, ARGV[15])
    if redis.call('PTTL', KEYS[5]) < deadline - now then redis.call('PEXPIREAT', KEYS[5], deadline) end
  end
end
if waiting == 0 then lane = 2 end
return {1, redis.call('LPUSH', KEYS[lane], unpack(ARGV, FIRST_JOB)), ahead}
