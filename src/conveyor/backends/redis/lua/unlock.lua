-- unlock: let go of a store-wide lock if the caller (its token) still holds it.
-- KEYS (named in K): lock = the lock's key. ARGV: token. Returns 1 if it was held, else 0.
if redis.call('GET', K.lock) == ARGV[1] then
  redis.call('DEL', K.lock)
  return 1
end
return 0
