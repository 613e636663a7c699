-- choose_device.lua: FUNNEL_DEVICE=auto, the candidate device with the fewest live workers and
-- fresh claims, claimed for this worker in the same step (worker/device.py). The live workers are
-- read before and passed in: their hashes live in their models' slots, which one script may not
-- span on a cluster. A worker with both a claim and a heartbeat is counted once.
--
-- KEYS[1]      the claims, funnel:device-claims: a sorted set of "<device> <worker id>" scored
--              by its expiry, epoch ms (expired ones are removed here)
-- ARGV[1]      this worker's id (its earlier claim is replaced)
-- ARGV[2]      the claim's lifetime, ms
-- ARGV[3]      n, the number of candidate devices
-- ARGV[4..3+n] the candidates, in order of preference (the first wins a tie)
-- ARGV[4+n..]  pairs: a live worker's id, its device
-- Returns      {the chosen device, then each candidate's count before this claim, in order}
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
local me = ARGV[1]
local last = 3 + tonumber(ARGV[3])
local counts, seen = {}, {}
for i = 4, last do counts[ARGV[i]] = 0 end
for _, member in ipairs(redis.call('ZRANGE', KEYS[1], 0, -1)) do
  local sp = string.find(member, ' ', 1, true)
  if sp then
    local device, id = string.sub(member, 1, sp - 1), string.sub(member, sp + 1)
    if id == me then
      redis.call('ZREM', KEYS[1], member)  -- this worker's earlier claim: replaced below
    elseif not seen[id] then
      seen[id] = true
      if counts[device] then counts[device] = counts[device] + 1 end
    end
  end
end
for i = last + 1, #ARGV, 2 do
  local id, device = ARGV[i], ARGV[i + 1]
  if id ~= me and not seen[id] and counts[device] then counts[device] = counts[device] + 1 end
end
local best = ARGV[4]
for i = 5, last do
  if counts[ARGV[i]] < counts[best] then best = ARGV[i] end
end
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[2]), best .. ' ' .. me)
local result = {best}
for i = 4, last do result[#result + 1] = counts[ARGV[i]] end
return result
