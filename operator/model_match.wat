;; Envoy finds the model a stock gRPC client's request names: a proxy-wasm filter
;; (ABI 0.2.1) that holds a request's headers until the first bytes of its body have come,
;; reads field 1 (model_name or name: a length-delimited string) of the first message
;; after gRPC's 5-byte prefix, and adds it as the `sonicsite-model` header, as if the client
;; had sent it; Envoy then picks the route again (operator/xds_model_match.py says why
;; this way). A compressed first message (flag byte 1) hides the name: the filter adds
;; `x-sonicsite-compressed: 1` instead, and Envoy's route for it refuses the call with the
;; reason. Built with wat2wasm (wabt, `make wasm`) into model_match.wasm beside it.
(module
  (import "env" "proxy_get_buffer_bytes"
    (func $get_buffer_bytes (param i32 i32 i32 i32 i32) (result i32)))
  (import "env" "proxy_add_header_map_value"
    (func $add_header_map_value (param i32 i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  ;; 0: where the host writes a buffer's address, 4: its size; 16: the header's name;
  ;; 48: the compressed marker's name, 80: its value;
  ;; 1024: every buffer the host asks for (one at a time: a VM serves one worker thread)
  (data (i32.const 16) "sonicsite-model")
  (data (i32.const 48) "x-sonicsite-compressed")
  (data (i32.const 80) "1")
  (global $SCAN i32 (i32.const 128))  ;; the most held: the name must be within these bytes
  (global $varint_end (mut i32) (i32.const 0))

  (func (export "proxy_abi_version_0_2_1"))
  (func (export "proxy_on_memory_allocate") (param $size i32) (result i32) (i32.const 1024))
  (func (export "proxy_on_context_create") (param i32 i32))
  (func (export "proxy_on_vm_start") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_configure") (param i32 i32) (result i32) (i32.const 1))
  (func (export "proxy_on_done") (param i32) (result i32) (i32.const 1))
  (func (export "proxy_on_delete") (param i32))

  ;; headers: held (StopIteration) until the body's first bytes, unless there is no body
  (func (export "proxy_on_request_headers")
    (param $context i32) (param $headers i32) (param $end i32) (result i32)
    (select (i32.const 0) (i32.const 1) (local.get $end)))

  ;; a varint at $at, read no further than $limit: its value, $varint_end after it;
  ;; -1 when it does not end before $limit (or is longer than 4 bytes: no name is)
  (func $varint (param $p i32) (param $at i32) (param $limit i32) (result i32)
    (local $value i32) (local $shift i32) (local $byte i32)
    (block $done
      (loop $next
        (if (i32.ge_u (local.get $at) (local.get $limit)) (then (return (i32.const -1))))
        (if (i32.ge_u (local.get $shift) (i32.const 28)) (then (return (i32.const -1))))
        (local.set $byte (i32.load8_u (i32.add (local.get $p) (local.get $at))))
        (local.set $value (i32.or (local.get $value)
          (i32.shl (i32.and (local.get $byte) (i32.const 127)) (local.get $shift))))
        (local.set $at (i32.add (local.get $at) (i32.const 1)))
        (local.set $shift (i32.add (local.get $shift) (i32.const 7)))
        (br_if $next (i32.ge_u (local.get $byte) (i32.const 128)))))
    (global.set $varint_end (local.get $at))
    (local.get $value))

  ;; a name the routes can hold: [A-Za-z0-9._-]+
  (func $plain (param $at i32) (param $n i32) (result i32)
    (local $c i32) (local $end i32)
    (if (i32.eqz (local.get $n)) (then (return (i32.const 0))))
    (local.set $end (i32.add (local.get $at) (local.get $n)))
    (block $bad
      (loop $next
        (local.set $c (i32.load8_u (local.get $at)))
        (br_if $bad (i32.eqz (i32.or (i32.or
          (i32.and (i32.ge_u (local.get $c) (i32.const 48)) (i32.le_u (local.get $c) (i32.const 57)))
          (i32.and (i32.ge_u (i32.or (local.get $c) (i32.const 32)) (i32.const 97))
                   (i32.le_u (i32.or (local.get $c) (i32.const 32)) (i32.const 122))))
          (i32.or (i32.or (i32.eq (local.get $c) (i32.const 46)) (i32.eq (local.get $c) (i32.const 95)))
                  (i32.eq (local.get $c) (i32.const 45))))))
        (local.set $at (i32.add (local.get $at) (i32.const 1)))
        (br_if $next (i32.lt_u (local.get $at) (local.get $end))))
      (return (i32.const 1)))
    (i32.const 0))

  ;; body: 0 (Continue: the header added, or none to add), 1 (StopIterationAndBuffer: the
  ;; name may be in bytes still to come)
  (func (export "proxy_on_request_body")
    (param $context i32) (param $size i32) (param $end i32) (result i32)
    (local $p i32) (local $got i32) (local $have i32) (local $limit i32) (local $at i32)
    (local $tag i32) (local $n i32)
    (local.set $limit (i32.const 0x7fffffff))
    (if (call $get_buffer_bytes (i32.const 0) (i32.const 0)
          (select (local.get $size) (global.get $SCAN) (i32.lt_u (local.get $size) (global.get $SCAN)))
          (i32.const 0) (i32.const 4))
      (then (return (i32.const 0))))
    (local.set $p (i32.load (i32.const 0)))
    (local.set $got (i32.load (i32.const 4)))
    (local.set $have (local.get $got))
    (block $more
      (br_if $more (i32.lt_u (local.get $have) (i32.const 5)))
      (if (i32.load8_u (local.get $p))  ;; compressed: marked, for the route that refuses it
        (then (drop (call $add_header_map_value (i32.const 0) (i32.const 48) (i32.const 22)
                      (i32.const 80) (i32.const 1)))
              (return (i32.const 0))))
      ;; the first message ends at 5 + its length (big-endian, bytes 1-4)
      (local.set $limit (i32.add (i32.const 5) (i32.or (i32.or
        (i32.shl (i32.load8_u offset=1 (local.get $p)) (i32.const 24))
        (i32.shl (i32.load8_u offset=2 (local.get $p)) (i32.const 16)))
        (i32.or (i32.shl (i32.load8_u offset=3 (local.get $p)) (i32.const 8))
                (i32.load8_u offset=4 (local.get $p))))))
      ;; what is parsed: the bytes held, up to the first message's end
      (if (i32.gt_u (local.get $have) (local.get $limit)) (then (local.set $have (local.get $limit))))
      (local.set $at (i32.const 5))
      (loop $field
        (if (i32.ge_u (local.get $at) (local.get $limit)) (then (return (i32.const 0))))
        (br_if $more (i32.ge_u (local.get $at) (local.get $have)))
        (local.set $tag (call $varint (local.get $p) (local.get $at) (local.get $have)))
        (br_if $more (i32.lt_s (local.get $tag) (i32.const 0)))
        (local.set $at (global.get $varint_end))
        (block $skipped
          (block $length
            (block $fixed32
              (block $fixed64
                (block $varint
                  (br_table $varint $fixed64 $length $skipped $skipped $fixed32 $skipped $skipped
                    (i32.and (local.get $tag) (i32.const 7))))
                (br_if $more (i32.lt_s
                  (call $varint (local.get $p) (local.get $at) (local.get $have)) (i32.const 0)))
                (local.set $at (global.get $varint_end))
                (br $field))
              (local.set $at (i32.add (local.get $at) (i32.const 8)))
              (br $field))
            (local.set $at (i32.add (local.get $at) (i32.const 4)))
            (br $field))
          ;; length-delimited: field 1 is the name
          (local.set $n (call $varint (local.get $p) (local.get $at) (local.get $have)))
          (br_if $more (i32.lt_s (local.get $n) (i32.const 0)))
          (local.set $at (global.get $varint_end))
          (if (i32.ne (i32.shr_u (local.get $tag) (i32.const 3)) (i32.const 1))
            (then (local.set $at (i32.add (local.get $at) (local.get $n))) (br $field)))
          (br_if $more (i32.gt_u (i32.add (local.get $at) (local.get $n)) (local.get $have)))
          (if (call $plain (i32.add (local.get $p) (local.get $at)) (local.get $n))
            (then (drop (call $add_header_map_value (i32.const 0) (i32.const 16) (i32.const 15)
                          (i32.add (local.get $p) (local.get $at)) (local.get $n)))))
          (return (i32.const 0)))
        (return (i32.const 0))))  ;; a group or an unknown wire type: not Triton's message
    ;; the name may be in bytes still to come: wait for them, within SCAN, the body and the
    ;; first message
    (select (i32.const 0) (i32.const 1)
      (i32.or (i32.or (local.get $end) (i32.ge_u (local.get $got) (global.get $SCAN)))
              (i32.ge_u (local.get $got) (local.get $limit)))))
)
