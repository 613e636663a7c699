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
--             (counted as jobs ahead, only with an estimate), ARGV[20] of them; then, when the jobs
--             are cached items, each job's entry, funnel:cache:{<model>}:..., and pending marker,
--             funnel:cache-pending:{<model>}:... (common/result_cache.py)
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
-- ARGV[18]    the request's items (with cached items: recounted, those to compute)
-- ARGV[19]    the items of a job queued or in flight, on average (the web's estimate)
-- ARGV[20]    the in-flight lists among KEYS (KEYS[6..5+ARGV[20]])
-- ARGV[21]    1 when each job is one cached item, 2 when so but its entry is not to be read
--             (found unreadable: computed again, and overwritten), 3 when so and no live worker
--             serves the version (answered only when every item is known: nothing is queued), else 0
-- ARGV[22]    the request's reply list, which a cached item computed for another request names
--             in its pending marker (read only when ARGV[21] is 1)
-- ARGV[23..]  the jobs to LPUSH, wire bytes; when ARGV[21] is 1, pairs: a job's id, its wire bytes
-- Returns     {1, the new length of the queue it went to, items ahead (-1: not estimated)} when pushed;
--             with cached items, a fourth element, for each job: "" queued (its marker names it),
--             "=" and its entry when known, or "~<job id> <deadline ms>" of the job computing it,
--             whose reply the request's reply list will be sent; the length is 0 when none was queued;
--             {0, items queued in its lane and above} when they are at the queue's limit;
--             {-1, items ahead} when the predicted wait is past the budget;
--             {-2, ms until the key has a token} past the key's rate;
--             {-3, ms until its earliest request under way is past its deadline} at the key's cap;
--             {-4, items not known} when ARGV[21] is 3 and some item is not known.
local FIRST_JOB = 23
local lane = tonumber(ARGV[17])
local n, per_job = tonumber(ARGV[18]), tonumber(ARGV[19])
local limited = ARGV[10] == '1'
local held_to = 5 + tonumber(ARGV[20])  -- the last in-flight list in KEYS
local cached = ARGV[21] ~= '0'
local states, misses = {}, {}  -- cached items: each job's answer; the jobs to push
if cached then
  -- Known, under way, or to compute: a job that finds its item known or computing is not pushed.
  local at = held_to + 1
  for i = FIRST_JOB, #ARGV, 2 do
    local entry = ARGV[21] ~= '2' and redis.call('GET', KEYS[at])
    if entry then
      table.insert(states, '=' .. entry)
    else
      local computing = redis.call('HMGET', KEYS[at + 1], 'job', 'deadline')
      if computing[1] then
        table.insert(states, '~' .. computing[1] .. ' ' .. (computing[2] or '0'))
      else
        table.insert(states, '')
        table.insert(misses, i)
      end
    end
    at = at + 2
  end
  n = #misses
  if ARGV[21] == '3' then  -- no worker: the known items answer, or nothing does
    local unknown = 0
    for _, state in ipairs(states) do
      if string.sub(state, 1, 1) ~= '=' then unknown = unknown + 1 end
    end
    if unknown > 0 then return {-4, unknown} end
  end
end
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
local function charge()  -- the key's token and its request under way, once admitted
  if not limited then return end
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
local function register()  -- the computing jobs' markers, and this request's wait on the others'
  local at = held_to + 1
  for _, state in ipairs(states) do
    if string.sub(state, 1, 1) == '~' then redis.call('HSET', KEYS[at + 1], ARGV[22], 1) end
    at = at + 2
  end
  local deadline = tonumber(ARGV[16])
  for _, i in ipairs(misses) do
    local marker = KEYS[held_to + i - FIRST_JOB + 2]
    redis.call('HSET', marker, 'job', ARGV[i], 'deadline', deadline)
    redis.call('PEXPIREAT', marker, deadline)
  end
end
if cached and n == 0 then  -- every item known or under way: nothing queued
  charge()
  register()
  return {1, 0, -1, states}
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
  for i = 6, held_to do held = held + redis.call('LLEN', KEYS[i]) end
  ahead = queued + math.ceil(held * per_job)
  local rate, item_s, batch_s, size = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6]), tonumber(ARGV[7])
  local k = math.min(size, ahead + n)
  local wait = math.max((ahead + n) / rate, item_s * k + batch_s) * tonumber(ARGV[8]) + tonumber(ARGV[9])
  if wait > tonumber(ARGV[3]) then return {-1, ahead} end
end
charge()
if waiting == 0 then lane = 2 end
if not cached then return {1, redis.call('LPUSH', KEYS[lane], unpack(ARGV, FIRST_JOB)), ahead} end
register()
local jobs = {}
for _, i in ipairs(misses) do table.insert(jobs, ARGV[i + 1]) end
return {1, redis.call('LPUSH', KEYS[lane], unpack(jobs)), ahead, states}
