// Reads partition 0 of each given topic from the beginning with Kafka's own KafkaConsumer
// (check.crcs on) and prints every record, so tests/test_codec_java.py can check that the Java
// client reads what kcore writes.
//
// Run in source-file mode with the broker's classpath:
//   java -cp '<kafka libs>/*' tests/java/ConsumeRecords.java BOOTSTRAP TOPIC:COUNT [TOPIC:COUNT...]
//
// Polls until each topic gave COUNT records (or 60 s pass: exit status 2). Prints one line a
// record, fields separated by one space:
//   TOPIC OFFSET TIMESTAMP_TYPE TIMESTAMP KEY VALUE HEADERS
// with TIMESTAMP_TYPE as Java names it (CreateTime, LogAppendTime), KEY and VALUE "-" for null
// or "x" followed by the bytes in hex, HEADERS "." for none or comma-separated NAMEHEX:VALUE
// pairs (the format tests/java/ProduceRecords.java reads).

import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.HexFormat;
import java.util.List;
import java.util.Map;
import java.util.Properties;

import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.ByteArrayDeserializer;

public class ConsumeRecords {
    static String bytes(byte[] b) {
        return b == null ? "-" : "x" + HexFormat.of().formatHex(b);
    }

    static String headers(ConsumerRecord<byte[], byte[]> r) {
        List<String> parts = new ArrayList<>();
        for (Header h : r.headers()) {
            parts.add(HexFormat.of().formatHex(h.key().getBytes(StandardCharsets.UTF_8)) + ":"
                      + bytes(h.value()));
        }
        return parts.isEmpty() ? "." : String.join(",", parts);
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        Map<TopicPartition, Integer> wanted = new HashMap<>();
        for (int i = 1; i < args.length; i++) {
            int colon = args[i].lastIndexOf(':');
            wanted.put(new TopicPartition(args[i].substring(0, colon), 0),
                       Integer.parseInt(args[i].substring(colon + 1)));
        }
        Properties props = new Properties();
        props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
        props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
        props.put(ConsumerConfig.CHECK_CRCS_CONFIG, "true");
        props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
        props.put(ConsumerConfig.CLIENT_ID_CONFIG, "kcore-codec-test-consumer");
        props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);
        props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, ByteArrayDeserializer.class);

        Map<TopicPartition, Integer> got = new HashMap<>();
        StringBuilder out = new StringBuilder();
        long deadline = System.nanoTime() + Duration.ofSeconds(60).toNanos();
        try (KafkaConsumer<byte[], byte[]> consumer = new KafkaConsumer<>(props)) {
            consumer.assign(wanted.keySet());
            consumer.seekToBeginning(wanted.keySet());
            while (!got.equals(wanted)) {
                if (System.nanoTime() > deadline) {
                    System.out.print(out);
                    System.err.println("timed out: wanted " + wanted + ", got " + got);
                    System.exit(2);
                }
                for (ConsumerRecord<byte[], byte[]> r : consumer.poll(Duration.ofMillis(200))) {
                    got.merge(new TopicPartition(r.topic(), r.partition()), 1, Integer::sum);
                    out.append(r.topic()).append(' ').append(r.offset()).append(' ')
                       .append(r.timestampType().name).append(' ').append(r.timestamp())
                       .append(' ').append(bytes(r.key())).append(' ')
                       .append(bytes(r.value())).append(' ').append(headers(r)).append('\n');
                }
            }
        }
        System.out.print(out);
    }
}
