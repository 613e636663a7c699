-- take.lua: fill a worker's batch from its model version's lanes (high, normal, low, bulk: see
-- common/contracts/priority.py), old ends first, into its in-flight list, in one round trip (worker/queue.py;
-- LMOVE needs Redis 6.2). First pass: each lane from the lowest up takes the places kept for it
-- (the floor shares, worker/lanes.py); second pass: each lane in order, high first, fills what is
-- still free. No lane takes more than its cap. Idle workers block on the normal
-- queue (worker/queue.py): a full batch that leaves the normal queue empty and jobs waiting in the
-- high or low lane moves the oldest of them (high's first) to the normal queue, so one wakes for it.
-- Counts are in items: a job holds one request's items (common/contracts/wire.py writes their count `n` second
-- in its message, where head_of reads it). A lane takes jobs while it has room left, so its last
-- job may overrun the room by less than a job (the web makes no job larger than a batch, and the
-- worker runs a batch in parts of its size); a lane that overran its places pays it back from its
-- share later (worker/lanes.py). Never putting a job back keeps every lane's order, and a lane of large
-- jobs is never passed over for the small ones behind it.
--
-- KEYS[1]     this worker's in-flight list, funnel:inflight:{<model>}:<worker>
-- KEYS[2]     the model's gone set, funnel:gone:{<model>} (see common/link/lua/leave.lua): a job marked
--             there is dropped unrun and its mark removed (a job whose id head_of cannot read runs)
-- KEYS[3..6]  the lanes in the order served: funnel:queue-high:, funnel:queue:, funnel:queue-low:,
--             funnel:bulk:{<model>}:<version>
-- ARGV[1]     how many items to take at most
-- ARGV[2..]   for each lane of KEYS[3..] in turn: the places (items) kept for it, taken first
-- ARGV[2+L..] for each lane in turn: how many items it may take at most (L: the number of lanes)
-- ARGV[2+2L]  1 to check the newest job of the in-flight list first, the one an idle worker's BLMOVE
--             moved there (worker/queue.py): marked gone, it is dropped as a job taken here would be
-- Returns     {{items taken from each lane}, {every job taken, wire bytes, oldest of each lane first},
--             {the ids of the jobs dropped, their clients gone}, the in-flight list's length after}
local lanes = #KEYS - 2
local want = tonumber(ARGV[1])
local taken, counts, items = {}, {}, 0

local function head_of(job)  -- a job's items (at least 1) and id, from its message's first bytes
  -- (common/contracts/wire.py writes v, then n for several items, then id, in a fixmap or map 16): 1 and nil
  -- where unread; a byte past the end of a short message reads as 0, as wire.item_count reads it
  local function byte(i) return string.byte(job, i) or 0 end
  local head = byte(1)
  local at = (head >= 0x80 and head <= 0x8f) and 2 or (head == 0xde and 4 or nil)
  if not at or string.sub(job, at, at + 2) ~= '\161v\1' then return 1, nil end
  at = at + 3
  local n = 1
  if string.sub(job, at, at + 1) == '\161n' then
    local kind = byte(at + 2)
    if kind == 0xcc then n, at = byte(at + 3), at + 4
    elseif kind == 0xcd then n, at = byte(at + 3) * 256 + byte(at + 4), at + 5
    elseif kind <= 0x7f then n, at = kind, at + 3
    else return 1, nil end
    n = math.max(1, n)
  end
  if string.sub(job, at, at + 2) ~= '\162id' then return n, nil end
  local size = byte(at + 3)
  if size >= 0xa0 and size <= 0xbf then return n, string.sub(job, at + 4, at + 3 + size - 0xa0) end
  if size == 0xd9 then return n, string.sub(job, at + 5, at + 4 + byte(at + 4)) end
  return n, nil
end

local marked = redis.call('ZCARD', KEYS[2]) > 0
local left = {}  -- the ids of jobs whose client left: dropped here, unrun, their marks forgotten
local function take(lane, count)
  count = math.min(count, tonumber(ARGV[1 + lanes + lane]) - counts[lane])
  while count > 0 do
    local job = redis.call('LMOVE', KEYS[2 + lane], KEYS[1], 'RIGHT', 'LEFT')
    if not job then return end
    local n, id = head_of(job)
    if marked and id and redis.call('ZSCORE', KEYS[2], id) then
      redis.call('ZREM', KEYS[2], id)
      redis.call('LPOP', KEYS[1])
      left[#left + 1] = id
    else
      taken[#taken + 1] = job
      counts[lane], items, count = counts[lane] + n, items + n, count - n
    end
  end
end
if marked and ARGV[2 + 2 * lanes] == '1' then
  local _, id = head_of(redis.call('LINDEX', KEYS[1], 0) or '')
  if id and redis.call('ZSCORE', KEYS[2], id) then
    redis.call('ZREM', KEYS[2], id)
    redis.call('LPOP', KEYS[1])
    left[1] = id
  end
end
for lane = 1, lanes do counts[lane] = 0 end
for lane = lanes, 1, -1 do take(lane, math.min(tonumber(ARGV[1 + lane]), want - items)) end  -- places kept
for lane = 1, lanes do take(lane, want - items) end
if items >= want and redis.call('LLEN', KEYS[4]) == 0 then
  if not redis.call('RPOPLPUSH', KEYS[3], KEYS[4]) then redis.call('RPOPLPUSH', KEYS[5], KEYS[4]) end
end
return {counts, taken, left, redis.call('LLEN', KEYS[1])}
