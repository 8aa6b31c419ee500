// Package routing makes tether's routing decisions: which conversation a
// request belongs to, which key it routes by, and where a new key is placed.
// It is pure: no I/O, no clock (time is a parameter), no randomness.
package routing
