-- store_results.lua: store answered items of one job by index, once each, and count them
-- (common/bulk/jobs.py: on a single Redis inside a worker's reply MULTI or recovery's; on a Redis
-- Cluster a call of its own, before the reply script forgets the items' messages).
-- include: webhook_due.lua (prepended by common/link/lua_scripts.py)
-- include: in_flight.lua
--
-- KEYS[1]    the job record, funnel:job:{<id>}
-- KEYS[2]    its results hash, funnel:job:{<id>}:results (item index -> msgpack reply)
-- KEYS[3]    the due webhooks, funnel:webhooks; absent on a cluster (another slot: the caller
--            marks the delivery due when this says it is pending)
-- KEYS[4]    the answering worker's in-flight list, funnel:inflight:{<model>}:<worker>: given only
--            in its reply MULTI on a single Redis (before the reply script forgets the messages),
--            where an item is stored only while its message is still there: a worker paused past
--            its heartbeat, whose items a peer recovered, stores nothing once resumed
-- ARGV[1]    now, epoch ms
-- ARGV[2]    the job id
-- ARGV[3..]  triples: item index, msgpack reply, 1 if the reply is a success else 0; with KEYS[4],
--            quintuples: those, the item's message as taken by its handle (in_flight.lua: the wire
--            bytes, or their first bytes where they are long) and the message's length in bytes
-- Returns    {new, pending}: how many replies were new (HSETNX: a second answer to an item is
--            counted in the record's duplicates, never stored), -1 when the job expired or never
--            was (its results are dropped: nothing would ever read them); pending 1 while the job's
--            webhook delivery is pending, else 0. The item that completes the job stamps
--            finished_ms and makes its webhook due; both keys' TTL is pushed to ttl_ms.
if redis.call('EXISTS', KEYS[1]) == 0 then return {-1, 0} end
local new, failed, seen = 0, 0, 0
local held = KEYS[4]
local width = held and 5 or 3
for i = 3, #ARGV, width do
  if not held or taken_message(held, ARGV[i + 3], ARGV[i + 4], false) then
    seen = seen + 1
    if redis.call('HSETNX', KEYS[2], ARGV[i], ARGV[i + 1]) == 1 then
      new = new + 1
      if ARGV[i + 2] == '0' then failed = failed + 1 end
    end
  end
end
local done = redis.call('HINCRBY', KEYS[1], 'done', new)
if failed > 0 then redis.call('HINCRBY', KEYS[1], 'failed', failed) end
if seen > new then redis.call('HINCRBY', KEYS[1], 'duplicates', seen - new) end
if new > 0 and done >= tonumber(redis.call('HGET', KEYS[1], 'total')) then
  redis.call('HSET', KEYS[1], 'finished_ms', ARGV[1])
  webhook_due(KEYS[1], KEYS[3], ARGV[2], ARGV[1])
end
local ttl = tonumber(redis.call('HGET', KEYS[1], 'ttl_ms'))
redis.call('PEXPIRE', KEYS[1], ttl)
if redis.call('EXISTS', KEYS[2]) == 1 then redis.call('PEXPIRE', KEYS[2], ttl) end
return {new, webhook_pending(KEYS[1])}
