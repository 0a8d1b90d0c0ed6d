-- Admit now, queue fairly, or refuse. ARGV from 9: revision, request id, principal, provider,
-- budget id, tokens, cost, attempts, dwell limit (ms), deadline (ms from now), '1' when the
-- caller has this workspace registered for its process already.
local done, epoch = open_ws(true)
if done then return done end
REGISTERED = ARGV[19] == '1'
local w = {
  id = ARGV[10], pid = ARGV[11], prov = ARGV[12], bud = ARGV[13], proc = PROC,
  tok = tonumber(ARGV[14]), cost = tonumber(ARGV[15]), att = tonumber(ARGV[16]), arr = NOW,
}
-- A call repeated after a lost connection must not take a second permit or place; a waiter
-- queued again finds the grant made for it meanwhile, and takes it.
local held = redis.call('HGET', LEASES, w.id)
if held then
  local lease = cjson.decode(held)
  if lease.off ~= nil then
    lease.off = nil
    redis.call('HSET', LEASES, w.id, cjson.encode(lease))
    redis.call('ZREM', OFFERS, w.id)
  end
  local ev = evidence({pid = lease.pid, prov = lease.prov})
  ev.st = 'admit'
  ev.ep = epoch
  return reply(ev)
end
if redis.call('HEXISTS', WAITERS, w.id) == 1 then
  local ev = evidence(w)
  ev.st = 'queued'
  ev.ep = epoch
  return reply(ev)
end
-- The caller withdrew this request already (its answer was lost): a late copy takes nothing.
if redis.call('EXISTS', BASE .. 't:' .. w.id) == 1 then
  return reply({st = 'reject', reason = 'cancelled', ep = epoch})
end
local rev = preload('W', 'P:' .. w.pid, 'V:' .. w.prov, 'rsv')
if not rev then return reply({st = 'noprofile', ep = epoch}) end
if rev ~= ARGV[9] then
  return reply({st = 'stale', ep = epoch, rev = rev, seq = tonumber(redis.call('HGET', PROF, 'pseq'))})
end
local lp, lw, lv = limits('P:' .. w.pid), limits('W'), limits('V:' .. w.prov)
if not lp then return reply({st = 'reject', reason = 'unconfigured-principal', ep = epoch}) end
if not lv then return reply({st = 'reject', reason = 'unconfigured-provider', ep = epoch}) end
local function refuse(reason)
  count(w.prov, 'reject', reason)
  local ev = evidence(w)
  ev.st = 'reject'
  ev.reason = reason
  ev.ep = epoch
  if #RESULT_TRANSITIONS > 0 then ev.tr = RESULT_TRANSITIONS end
  return reply(ev)
end
local reason = budgets_reason(w, lp, lw, lv)
if reason then return refuse(reason) end
local lane = lane_of(w.prov, w.pid)
local qk = lane_key(lane)
local verdict, at, hold
verdict = 'defer'
if redis.call('LLEN', qk) == 0 then
  verdict, reason, at, hold = dispatch_check(w, lp, lw, lv)
  if verdict == 'admit' then
    local ev = admit(w, lp, lw, lv)
    count(w.prov, 'admit', 'admitted')
    count_delay(w.prov, 0)
    ev.st = 'admit'
    ev.ep = epoch
      if #RESULT_TRANSITIONS > 0 then ev.tr = RESULT_TRANSITIONS end
    return reply(ev)
  end
  if verdict == 'reject' then return refuse(reason) end
end
if queue_full(w, lp, lw, lv) then return refuse('queue-full') end
-- Queued: it expires at its own deadline or dwell limit, whichever comes first.
local dwell, deadline = tonumber(ARGV[17]), tonumber(ARGV[18])
if deadline ~= nil and (dwell == nil or deadline <= dwell) then
  w.exp, w.expr = NOW + deadline, 'deadline-exceeded'
elseif dwell ~= nil then
  w.exp, w.expr = NOW + dwell, 'queue-timeout'
end
if hold ~= nil and hold.h == nil then
  hold.h = w.id
  hold.ht = w.tok or 0
  touch(hold)
  w.hold = {hold._key}
end
redis.call('HSET', WAITERS, w.id, cjson.encode(w))
redis.call('RPUSH', qk, w.id)
if redis.call('ZSCORE', ROT, lane) == false then
  -- A new lane joins the rotation just ahead of the lane served last.
  redis.call('ZADD', ROT, rotation_now() - 0.5, lane)
end
local sp, sw, sv = scope(key_p(w.pid)), scope(key_w()), scope(key_v(w.prov))
local sx = scope(key_x(w.prov, w.pid))
for _, s in ipairs({sp, sw, sv, sx}) do
  s.q = s.q + 1
  touch(s)
end
if not REGISTERED then heartbeat() end
if at ~= nil then
  local known = redis.call('HGET', META, 'wk')
  if known == false or tonumber(known) > at then
    redis.call('HSET', META, 'wk', string.format('%.17g', at))
  end
end
if reason ~= nil then count(w.prov, 'defer', reason) end
local ev = evidence(w)
ev.q = ev.q - 1
ev.st = 'queued'
ev.reason = reason
ev.ep = epoch
if at ~= nil then ev.wake = at - NOW end
if #RESULT_TRANSITIONS > 0 then ev.tr = RESULT_TRANSITIONS end
return reply(ev)
