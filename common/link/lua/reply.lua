-- reply.lua: answer one batch of a worker's (worker/reply.py): each message the batch took leaves
-- the worker's in-flight list, and its reply is pushed (its dead letter parked) only if the message
-- was still there. A worker paused past its heartbeat finds its jobs recovered by a peer, which
-- requeued them: they are answered by whoever runs them next, never a second time by it; and a
-- second run of the same answer (its first answer lost) pushes nothing again.
-- A job of a cached item (common/result_cache.py) stores its reply as the item's entry when it
-- succeeded, and, if it is the job the item's pending marker names, pushes the same reply to every
-- reply list waiting there (requests that asked for the item while it was computed, each waiting
-- for this job's id) and drops the marker.
-- include: in_flight.lua (prepended by common/link/lua_scripts.py)
--
-- KEYS[1]   the worker's in-flight list, funnel:inflight:{<model>}:<worker>
-- KEYS[2]   the model's dead letters, funnel:dead:{<model>}
-- KEYS[3..] the reply lists the batch's replies go to, funnel:reply:{<model>}:<inbox>; then, for each
--           cached item, its entry funnel:cache:{<model>}:... followed by its pending marker
--           funnel:cache-pending:{<model>}:... (the waiting reply lists it names are in the model's slot too)
-- ARGV[1]   the reply lists' TTL, seconds
-- ARGV[2]   the cache entries' TTL, ms
-- ARGV[3..] octuples: a message taken, by its handle (in_flight.lua: the wire bytes, or their first
--           bytes where they are long); its length in bytes; the index in KEYS of its reply list (0: no
--           reply, as for an expired job or a bulk item, whose result is stored apart); its reply
--           (wire bytes, "" for none; a cached bulk item's result, for its entry only); 1 to park the
--           message as a dead letter, else 0; the index in KEYS of its item's cache entry (0: not
--           cached); its job's id; 1 to store the reply as the entry (a success), else 0
-- Returns   for each message in turn, 1 if it was still in flight (and so answered), else 0
local held, pushes = {}, {}
local ttl = ARGV[1]
for i = 3, #ARGV, 8 do
  local message = taken_message(KEYS[1], ARGV[i], ARGV[i + 1], true)
  table.insert(held, message and 1 or 0)
  if message then
    local list = tonumber(ARGV[i + 2])
    if list > 0 then
      pushes[list] = pushes[list] or {}
      table.insert(pushes[list], ARGV[i + 3])
    end
    if ARGV[i + 4] == '1' then redis.call('LPUSH', KEYS[2], message) end
    local entry = tonumber(ARGV[i + 5])
    if entry > 0 then
      if ARGV[i + 7] == '1' then redis.call('SET', KEYS[entry], ARGV[i + 3], 'PX', ARGV[2]) end
      local pending = KEYS[entry + 1]
      if redis.call('HGET', pending, 'job') == ARGV[i + 6] then
        local own = list > 0 and KEYS[list] or ''
        for _, waiting in ipairs(redis.call('HKEYS', pending)) do
          if waiting ~= 'job' and waiting ~= 'deadline' and waiting ~= own then
            redis.call('LPUSH', waiting, ARGV[i + 3])
            redis.call('EXPIRE', waiting, ttl)
          end
        end
        redis.call('DEL', pending)
      end
    end
  end
end
for list, payloads in pairs(pushes) do  -- a web process's inbox takes its share in one push
  redis.call('LPUSH', KEYS[list], unpack(payloads))
  redis.call('EXPIRE', KEYS[list], ttl)
end
return held
