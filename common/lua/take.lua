-- take.lua: fill a worker's batch from its model version's lanes (high, normal, low, bulk: see
-- common/priority.py), old ends first, into its in-flight list, in one round trip (worker/queue.py;
-- RPOP with a count needs Redis 6.2). First pass: each lane in order takes what the places kept for
-- the lanes below it that have jobs waiting leave (the floor shares, worker/lanes.py); second pass: each lane in order
-- fills what is still free. No lane takes more than its cap. Idle workers block on the normal
-- queue (worker/queue.py): a full batch that leaves the normal queue empty and jobs waiting in the
-- high or low lane moves the oldest of them (high's first) to the normal queue, so one wakes for it.
--
-- KEYS[1]     this worker's in-flight list, funnel:inflight:{<model>}:<worker>
-- KEYS[2]     the model's gone set, funnel:gone:{<model>} (only counted: see common/lua/leave.lua)
-- KEYS[3..6]  the lanes in the order served: funnel:queue-high:, funnel:queue:, funnel:queue-low:,
--             funnel:bulk:{<model>}:<version>
-- ARGV[1]     how many jobs to take at most
-- ARGV[2..]   for each lane of KEYS[3..] in turn: the places kept for it on the first pass
-- ARGV[2+L..] for each lane in turn: how many it may take at most (L: the number of lanes)
-- Returns     {{jobs taken from each lane}, {every job taken, wire bytes, oldest of each lane first},
--             jobs marked gone, the in-flight list's length after the take}
local lanes = #KEYS - 2
local want = tonumber(ARGV[1])
local taken, counts = {}, {}
local function take(lane, count)
  count = math.min(count, tonumber(ARGV[1 + lanes + lane]) - counts[lane])
  if count <= 0 then return end
  local jobs = redis.call('RPOP', KEYS[2 + lane], count)
  if not jobs then return end
  for i = 1, #jobs do
    redis.call('LPUSH', KEYS[1], jobs[i])
    taken[#taken + 1] = jobs[i]
  end
  counts[lane] = counts[lane] + #jobs
end
local places, kept = {}, 0  -- places kept for the lanes below the one taking: only lanes with jobs waiting
for lane = 1, lanes do
  counts[lane] = 0
  places[lane] = tonumber(ARGV[1 + lane])
  if places[lane] > 0 and redis.call('LLEN', KEYS[2 + lane]) == 0 then places[lane] = 0 end
  kept = kept + places[lane]
end
for lane = 1, lanes do
  kept = kept - places[lane]
  take(lane, want - #taken - kept)
end
for lane = 1, lanes do take(lane, want - #taken) end
if #taken >= want and redis.call('LLEN', KEYS[4]) == 0 then
  if not redis.call('RPOPLPUSH', KEYS[3], KEYS[4]) then redis.call('RPOPLPUSH', KEYS[5], KEYS[4]) end
end
return {counts, taken, redis.call('ZCARD', KEYS[2]), redis.call('LLEN', KEYS[1])}
