-- reply.lua: answer one batch of a worker's (worker/reply.py): each message the batch took leaves
-- the worker's in-flight list, and its reply is pushed (its dead letter parked) only if the message
-- was still there. A worker paused past its heartbeat finds its jobs recovered by a peer, which
-- requeued them: they are answered by whoever runs them next, never a second time by it; and a
-- second run of the same answer (its first answer lost) pushes nothing again.
--
-- KEYS[1]   the worker's in-flight list, funnel:inflight:{<model>}:<worker>
-- KEYS[2]   the model's dead letters, funnel:dead:{<model>}
-- KEYS[3..] the reply lists the batch's replies go to, funnel:reply:{<model>}:<inbox>
-- ARGV[1]   the reply lists' TTL, seconds
-- ARGV[2..] quadruples: a message taken (wire bytes); the index in KEYS of its reply list (0: no
--           reply, as for an expired job or a bulk item, whose result is stored apart); its reply
--           (wire bytes, "" for none); 1 to park the message as a dead letter, else 0
-- Returns   for each message in turn, 1 if it was still in flight (and so answered), else 0
local held, pushes = {}, {}
for i = 2, #ARGV, 4 do
  local found = redis.call('LREM', KEYS[1], -1, ARGV[i])
  table.insert(held, found > 0 and 1 or 0)
  if found > 0 then
    local list = tonumber(ARGV[i + 1])
    if list > 0 then
      pushes[list] = pushes[list] or {}
      table.insert(pushes[list], ARGV[i + 2])
    end
    if ARGV[i + 3] == '1' then redis.call('LPUSH', KEYS[2], ARGV[i]) end
  end
end
for list, payloads in pairs(pushes) do  -- a web process's inbox takes its share in one push
  redis.call('LPUSH', KEYS[list], unpack(payloads))
  redis.call('EXPIRE', KEYS[list], ARGV[1])
end
return held
