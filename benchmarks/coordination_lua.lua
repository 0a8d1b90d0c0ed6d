-- The admission function library run outside Redis, for coordination_lua.py: an in-memory
-- stand-in for the Redis commands the functions call, and a count of the VM instructions each
-- line of the library executes.
--
--   lua5.1 coordination_lua.lua LIBRARY CALLS WARM
--
-- LIBRARY is the library's code (without its first line); CALLS a Lua file returning a list of
-- {function name, arguments}; the first WARM calls are not counted. Prints, one per line, the
-- call's answer of the first and last call ("answer" TAB text), the number of calls counted
-- ("calls" TAB n), and then "count" TAB source:line for every line that ran.

cjson = require('cjson')

local store = {}
-- Redis's clock, in microseconds: each TIME is 137 µs after the one before.
local clock = 1764950000000000

local function hash(key)
  local v = store[key]
  if v == nil then
    v = {}
    store[key] = v
  end
  return v
end

local function nargs(...) return select('#', ...) end

-- Removes the named entries from `t` (fields of a hash, members of a set, keys of the store);
-- returns how many were there.
local function remove(t, ...)
  local gone = 0
  for i = 1, nargs(...) do
    local name = select(i, ...)
    if t[name] ~= nil then
      gone = gone + 1
      t[name] = nil
    end
  end
  return gone
end

local C = {}
function C.TIME()
  clock = clock + 137
  return {string.format('%d', math.floor(clock / 1e6)), string.format('%d', clock % 1e6)}
end
function C.HMGET(key, ...)
  local v, out = store[key] or {}, {}
  for i = 1, nargs(...) do
    local x = v[select(i, ...)]
    if x == nil then out[i] = false else out[i] = x end
  end
  return out
end
function C.HGET(key, field)
  local v = store[key]
  if v == nil or v[field] == nil then return false end
  return v[field]
end
function C.HSET(key, ...)
  local v, added = hash(key), 0
  for i = 1, nargs(...), 2 do
    local field = select(i, ...)
    if v[field] == nil then added = added + 1 end
    v[field] = tostring(select(i + 1, ...))
  end
  return added
end
function C.HDEL(key, ...) return remove(store[key] or {}, ...) end
function C.HKEYS(key)
  local out = {}
  for field in pairs(store[key] or {}) do out[#out + 1] = field end
  return out
end
function C.HGETALL(key)
  local out = {}
  for field, x in pairs(store[key] or {}) do
    out[#out + 1] = field
    out[#out + 1] = x
  end
  return out
end
function C.HEXISTS(key, field)
  if store[key] ~= nil and store[key][field] ~= nil then return 1 end
  return 0
end
function C.DEL(...) return remove(store, ...) end
function C.EXISTS(key)
  if store[key] ~= nil then return 1 end
  return 0
end
function C.SET(key, value, ...)
  for i = 1, nargs(...) do
    if select(i, ...) == 'NX' and store[key] ~= nil then return false end
  end
  store[key] = value
  return {ok = 'OK'}
end
function C.GET(key)
  local v = store[key]
  if v == nil then return false end
  return v
end
function C.ZADD(key, ...)
  local v, a, i, added = hash(key), {...}, 1, 0
  while a[i] == 'NX' or a[i] == 'XX' or a[i] == 'GT' or a[i] == 'LT' or a[i] == 'CH' do
    i = i + 1
  end
  while i < #a do
    if v[a[i + 1]] == nil then added = added + 1 end
    v[a[i + 1]] = tonumber(a[i])
    i = i + 2
  end
  return added
end
function C.ZSCORE(key, member)
  local v = store[key]
  if v == nil or v[member] == nil then return false end
  return tostring(v[member])
end
function C.ZREM(key, ...) return remove(store[key] or {}, ...) end
function C.ZRANGEBYSCORE(key, _, high)
  local out, top = {}, tonumber(high) or math.huge
  for member, score in pairs(store[key] or {}) do
    if score <= top then out[#out + 1] = member end
  end
  return out
end
function C.LLEN(key) return #(store[key] or {}) end
function C.PEXPIRE() return 1 end
function C.PERSIST() return 1 end

local functions = {}
redis = {
  call = function(command, ...)
    local run = C[command]
    if run == nil then error('the stand-in has no ' .. command) end
    return run(...)
  end,
  register_function = function(name, body) functions[name] = body end,
  set_repl = function() end,
  REPL_NONE = 0,
  REPL_ALL = 3,
  error_reply = function(text) return {err = text} end,
  status_reply = function(text) return {ok = text} end,
  log = function() end,
  LOG_WARNING = 3,
}

dofile(arg[1])
local calls = dofile(arg[2])
local warm = tonumber(arg[3])
local counts = {}
local function count()
  local info = debug.getinfo(2, 'Sl')
  if info.what ~= 'C' then
    local at = info.short_src .. ':' .. info.currentline
    counts[at] = (counts[at] or 0) + 1
  end
end

for i, call in ipairs(calls) do
  if i == warm + 1 then debug.sethook(count, '', 1) end
  local ok, answer = pcall(functions[call[1]], {}, call[2])
  if not ok then
    debug.sethook()
    io.stderr:write('call ' .. i .. ' failed: ' .. tostring(answer) .. '\n')
    os.exit(1)
  end
  if i == warm + 1 or i == #calls then
    debug.sethook()
    print('answer\t' .. tostring(answer))
    debug.sethook(count, '', 1)
  end
end
debug.sethook()
print('calls\t' .. (#calls - warm))
for at, n in pairs(counts) do print(n .. '\t' .. at) end
