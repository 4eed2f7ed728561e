// Sends a fixed set of records with Kafka's own KafkaProducer, once per compression codec, so
// tests/test_codec_java.py can check that kcore decodes what the Java client writes.
//
// Run in source-file mode with the broker's classpath:
//   java -cp '<kafka libs>/*' tests/java/ProduceRecords.java BOOTSTRAP TOPIC_PREFIX CODEC[,CODEC...]
//
// The records come on standard input, one per line, each field separated by one space:
//   TIMESTAMP KEY VALUE HEADERS [flush]
// KEY and VALUE are "-" for null or "x" followed by the bytes in hex ("x" alone is empty);
// HEADERS is "." for none, else comma-separated NAMEHEX:VALUE pairs (VALUE encoded as above,
// NAMEHEX the UTF-8 header name in hex, possibly empty). A trailing "flush" flushes the producer
// after that record, which closes the batch: the records between flushes form one batch.
// Every codec's records go to partition 0 of topic TOPIC_PREFIX-CODEC. Prints "sent TOPIC N"
// per codec; any failure exits non-zero with the stack trace on stderr.

import java.io.BufferedReader;
import java.io.InputStreamReader;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.HexFormat;
import java.util.List;
import java.util.Properties;
import java.util.concurrent.Future;

import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.header.internals.RecordHeader;
import org.apache.kafka.common.header.internals.RecordHeaders;
import org.apache.kafka.common.serialization.ByteArraySerializer;

public class ProduceRecords {
    record Line(long timestamp, byte[] key, byte[] value, RecordHeaders headers, boolean flush) {}

    static byte[] bytes(String field) {
        if (field.equals("-")) {
            return null;
        }
        if (!field.startsWith("x")) {
            throw new IllegalArgumentException("bad bytes field: " + field);
        }
        return HexFormat.of().parseHex(field.substring(1));
    }

    static RecordHeaders headers(String field) {
        RecordHeaders headers = new RecordHeaders();
        if (field.equals(".")) {
            return headers;
        }
        for (String pair : field.split(",", -1)) {
            int colon = pair.indexOf(':');
            String name = new String(
                HexFormat.of().parseHex(pair.substring(0, colon)), StandardCharsets.UTF_8);
            headers.add(new RecordHeader(name, bytes(pair.substring(colon + 1))));
        }
        return headers;
    }

    public static void main(String[] args) throws Exception {
        String bootstrap = args[0];
        String prefix = args[1];
        String[] codecs = args[2].split(",");

        List<Line> lines = new ArrayList<>();
        BufferedReader in = new BufferedReader(
            new InputStreamReader(System.in, StandardCharsets.US_ASCII));
        for (String text = in.readLine(); text != null; text = in.readLine()) {
            if (text.isBlank()) {
                continue;
            }
            String[] f = text.trim().split(" ");
            lines.add(new Line(Long.parseLong(f[0]), bytes(f[1]), bytes(f[2]), headers(f[3]),
                               f.length > 4 && f[4].equals("flush")));
        }

        for (String codec : codecs) {
            Properties props = new Properties();
            props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
            props.put(ProducerConfig.ACKS_CONFIG, "all");
            props.put(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec);
            // Batches close only on flush(): one batch per flushed group of records.
            props.put(ProducerConfig.LINGER_MS_CONFIG, "60000");
            props.put(ProducerConfig.BATCH_SIZE_CONFIG, Integer.toString(4 * 1024 * 1024));
            props.put(ProducerConfig.MAX_REQUEST_SIZE_CONFIG, Integer.toString(16 * 1024 * 1024));
            props.put(ProducerConfig.CLIENT_ID_CONFIG, "kcore-codec-test-" + codec);
            props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
            props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, ByteArraySerializer.class);
            String topic = prefix + "-" + codec;
            try (KafkaProducer<byte[], byte[]> producer = new KafkaProducer<>(props)) {
                List<Future<RecordMetadata>> sent = new ArrayList<>();
                for (Line line : lines) {
                    sent.add(producer.send(new ProducerRecord<>(
                        topic, 0, line.timestamp(), line.key(), line.value(), line.headers())));
                    if (line.flush()) {
                        producer.flush();
                    }
                }
                producer.flush();
                for (Future<RecordMetadata> f : sent) {
                    f.get();  // surfaces any send error
                }
            }
            System.out.println("sent " + topic + " " + lines.size());
        }
    }
}
