-- take.lua: fill a worker's batch from its model version's queues' old ends into its in-flight list, in
-- one round trip (worker/queue.py; RPOP with a count needs Redis 6.2): from the interactive queue
-- all but ARGV[2] places, then up to ARGV[3] bulk items into the rest, then the interactive queue
-- again into what bulk left.
--
-- KEYS[1]  the interactive queue, funnel:queue:{<model>}:<version>
-- KEYS[2]  this worker's in-flight list, funnel:inflight:{<model>}:<worker>
-- KEYS[3]  the bulk queue, funnel:bulk:{<model>}:<version>
-- KEYS[4]  the model's gone set, funnel:gone:{<model>} (only counted: see common/lua/leave.lua)
-- ARGV[1]  how many jobs to take at most
-- ARGV[2]  places kept for bulk items on the first pass (the bulk share)
-- ARGV[3]  how many bulk items to take at most
-- Returns  {interactive jobs taken, {every job taken, wire bytes, oldest first}, jobs marked gone}
local want, share, bulk_cap = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local taken = {}
local function take(queue, count)
  if count <= 0 then return 0 end
  local jobs = redis.call('RPOP', queue, count)
  if not jobs then return 0 end
  for i = 1, #jobs do
    redis.call('LPUSH', KEYS[2], jobs[i])
    taken[#taken + 1] = jobs[i]
  end
  return #jobs
end
local interactive = take(KEYS[1], want - share)
take(KEYS[3], math.min(bulk_cap, want - #taken))
interactive = interactive + take(KEYS[1], want - #taken)
return {interactive, taken, redis.call('ZCARD', KEYS[4])}
